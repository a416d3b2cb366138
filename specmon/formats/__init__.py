"""One module per input format; each can recognise its input and read it."""
