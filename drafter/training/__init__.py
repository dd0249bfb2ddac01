"""Making drafters: data from the target, training batches, losses, the training loops and the large-target recipe.
"""
