"""The `specmon` command line: argument parsing and printing only; the work is in the layers below."""
