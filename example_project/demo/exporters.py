"""A JSON-lines feed exporter that hands each item to the operating system at once.

Scrapy's file feed storage writes through a buffer in the crawl's memory: a
node killed with -9 loses the items still in it, although their pages were
parsed and acknowledged. The fleet example counts every parsed page from the
nodes' feeds, so it flushes after each item (one write call an item).
"""

from __future__ import annotations

from typing import Any

from scrapy.exporters import JsonLinesItemExporter


class FlushingJsonLinesItemExporter(JsonLinesItemExporter):
    def export_item(self, item: Any) -> None:
        super().export_item(item)
        self.file.flush()
