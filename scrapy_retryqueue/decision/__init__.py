"""The retry decision, pure: kinds, classification, policies, backoff strategies, the learned model, budgets.

No I/O: a failure and what is known of its task and domain become a decision and a
delay. Redis, SQL and Scrapy's engine are layers above; this one never imports them.
"""
