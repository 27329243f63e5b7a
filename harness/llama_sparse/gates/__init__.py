"""Gates: the checks a change must pass (identity, needle-in-a-haystack, logits, A/B speed), defined in gates/*.yaml."""
