"""Audio in: reading files of any format (``files``), what a file's first bytes say it is (``sniff``),
the streamed log-Mel front end (``mel``) and voice activity (``vad``). No model, no options."""
