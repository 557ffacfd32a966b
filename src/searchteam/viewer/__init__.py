"""`searchteam view`: a read-only trace viewer in the browser over eval and training runs."""

from searchteam.viewer.app import create_app

__all__ = ["create_app"]
