"""Settings, the lowest layer: every default and tuning constant, and a number checked against its bounds.

Pure: no I/O, and nothing of the package above it. The settings a crawl reads are
validated once per crawler one layer up, in :mod:`scrapy_retryqueue.config`.
"""
