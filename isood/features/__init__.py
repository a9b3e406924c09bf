"""Features: CLIP models and text encoding, image listing and the one decode pipeline, image tensors, the feature
store, nearest-neighbour shift search (exact and ANN), labels, LAID training and images as datasets."""
