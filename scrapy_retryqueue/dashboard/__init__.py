"""The retry dashboard: a FastAPI application over the Redis queue and the SQL store.

Start it with ``scrapy retryqueue dashboard``; build it with
:func:`scrapy_retryqueue.dashboard.app.create_app`. It needs the ``dashboard``
extra (``pip install scrapy-retryqueue[dashboard]``).
"""
