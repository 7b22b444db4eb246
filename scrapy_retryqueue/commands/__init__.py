"""The commands a person runs: ``scrapy retryqueue`` and ``scrapy deadletters``."""
