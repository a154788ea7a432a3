"""Transcribing recordings: whisper's long-form loop over 30-second windows (``longform``), with
voice-activity chunks (``chunked``) and filter (``vad_filter``), and the transcript formats
(``outputs``)."""
