"""Data readers for the analyses (sentence pairs, compositionality items) and data the project wrote itself."""
