"""The Scrapy side: the add-on, the middlewares, the extensions, the leased frontier's scheduler, the monitors.

Thin glue: it reads Scrapy's objects and calls the runtime facade
(:mod:`scrapy_retryqueue.runtime`), never the parts behind it nor the queue.
"""
