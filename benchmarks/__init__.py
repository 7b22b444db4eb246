"""Benchmarks and scenario scripts for scrapy-retryqueue (not tests; see docs/)."""
