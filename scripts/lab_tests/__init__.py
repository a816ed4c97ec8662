"""The lab's own tests: its training recipes and the demo's summary line, run with the product's
tests (pytest's ``testpaths``). They import the lab as ``scripts.<folder>.<module>`` and the
helpers it shares with the tests as ``tests.helpers.<module>``."""
