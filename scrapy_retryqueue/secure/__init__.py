"""What keeps a stored request's secrets: encryption at rest, and what people may see of it (pure)."""
