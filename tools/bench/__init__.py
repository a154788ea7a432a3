"""Measurements of this project, one module per measurement: ``python -m tools.bench SUBCOMMAND``
(the list is in __main__.py). Kept free of imports: the memory probe of ``systems`` starts fresh
processes through this package and counts what they import."""
