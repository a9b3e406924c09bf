"""The stages of the WordNet commands (``isood wordnet filter``, ``isood wordnet audit``): options and jobs over
``wordnet_tools``."""
