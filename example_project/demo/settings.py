"""Settings of the demo project: the add-on line is all a project needs."""

BOT_NAME = "demo"
SPIDER_MODULES = ["demo.spiders"]
NEWSPIDER_MODULE = "demo.spiders"

ADDONS = {"scrapy_retryqueue.Addon": 0}

# The demo site is local: crawl it fast, and time out before its slow pages answer.
ROBOTSTXT_OBEY = False
CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 32
DOWNLOAD_DELAY = 0
DOWNLOAD_TIMEOUT = 2
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"

# Delays capped at a few seconds so the demo finishes in about 15 seconds; the
# defaults start as short, but let a chain of retries run for minutes to ride out
# an outage (docs/settings.md, "Why these defaults").
RETRYQUEUE_POLICIES = {
    "timeout": {"base_delay": 1, "max_delay": 8},
    "connection": {"base_delay": 1, "max_delay": 8},
    "rate_limited": {"base_delay": 1, "max_delay": 10},
    "server_error": {"base_delay": 1, "max_delay": 8},
    "parse": {"base_delay": 2, "max_delay": 10},
}
RETRYQUEUE_POLL_INTERVAL = 0.5
RETRYQUEUE_IDLE_TIMEOUT = 60
