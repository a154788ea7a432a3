"""Transcribing many files: the batch of files, what is done and the summary (``batch``), and the
Ray runner over many machines (``distributed``). Users of the facade."""
