"""The trained heads shipped with medusa-whisper: ``<base>-<kind>.pt`` with its training record
``<base>-<kind>.json``. Installed as the package ``medusa_whisper_heads`` (package data; see
setup.cfg); ``medusa_whisper.weights.heads_dir`` finds them."""
