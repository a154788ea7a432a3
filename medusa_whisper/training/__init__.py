"""Head training: pack audio into windows, cache the frozen base model's states, fit the heads."""
