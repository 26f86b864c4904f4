"""``layerscope bench``: every engine over the same texts in one process, speed and accuracy side by side."""
