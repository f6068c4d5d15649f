"""The read path: plans what to read from a file, reads it (whole leaves or byte ranges), fits and places it."""
