"""The store's Alembic migrations (``scrapy deadletters migrate`` applies them)."""
