"""What an evaluation or a grid looks like: heatmaps and curves, the HTML/Markdown report, per-set tables,
mosaics of a grid's images and the dataset card's figure."""
