"""rich.console stand-in (see rich/__init__.py)."""


class Console:
    def __init__(self, *args, **kwargs):
        pass

    def print(self, *args, **kwargs):
        print(*args)
