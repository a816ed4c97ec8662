import os
import sys


class LineCounter:
    """Count the lines of every file under a directory."""

    def __init__(self, root):
        self.root = root
        self.counts = {}

    def walk(self):
