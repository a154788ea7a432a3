"""Where weights come from and go: the CTranslate2 and Hugging Face readers (``ctranslate2``,
``hf``), the catalogue of names, downloads and the file cache (``weights``), conversion to a
whisper ``.pt`` (``convert``) and to whisper.cpp's file (``ggml``)."""
