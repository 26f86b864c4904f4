"""Decoding hidden states through a language-model head: the logit lens and decoded layer saliency."""
