"""Data the project wrote itself: compositionality items, generators of bilingual pairs, pair readers."""
