"""Proposers of candidate tokens (Medusa heads, a draft model, the EAGLE and CTC draft heads),
the candidate trees they propose, and the seam the decoding loop sees them through."""
