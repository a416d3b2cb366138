"""Reading inputs into the store: one module per format (formats/), the step-log contract, and the one pipeline
every entry stores through."""
