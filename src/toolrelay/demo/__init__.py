"""The end-to-end demo: RFC-0006's Postiz tool, dispatched through toolrelay."""
