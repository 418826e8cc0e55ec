"""The text a model learns from: the corpus and its sources (corpus, arrowdocs), the split rule (splits), the
evaluation sets cleaned of training overlap (decontaminate), tokenizers and the data hash (tokens), the data
prepared once into flat streams (prepared), and the Lightning data module that windows them (datamodule)."""
