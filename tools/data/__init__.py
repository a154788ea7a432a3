"""The data the tools read, made reproducibly: ``python -m tools.data SUBCOMMAND`` (the list is in
__main__.py). Everything goes under data/, which git ignores."""
