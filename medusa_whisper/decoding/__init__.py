"""Decoding a window: the public ``decode`` and its result (``window``), the one loop of a window
(``loop``: a pass verifies the proposals, the acceptance takes the longest accepted path), whisper's
rules as tensor operations (``rules``), the host's acceptance (``acceptance``), best_of candidates
and beams as whisper's DecodingTask over the step (``candidates``), and many windows side by side
(``batches``). Knows the step through its calls and proposers only through drafting's seam."""
