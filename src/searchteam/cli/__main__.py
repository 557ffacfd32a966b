from searchteam.cli import app

app()
