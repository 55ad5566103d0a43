"""ocp.args of the stand-in."""


class JsonSave:
    def __init__(self, item):
        self.item = item


class JsonRestore:
    def __init__(self, item=None):
        self.item = item


class Composite(dict):
    def __init__(self, **items):
        super().__init__(items)
