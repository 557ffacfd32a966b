"""searchteam's runs and questions in the shapes other trainers read: `export` (a run's turns as a Hugging
Face Parquet dataset, with TRL and step-wise views) and `questions` (prompt datasets for verl and SkyRL)."""
