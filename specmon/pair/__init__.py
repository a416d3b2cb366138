"""A local model pair: live speculative runs, losslessness checks of the loop, replay, and training the pair."""
