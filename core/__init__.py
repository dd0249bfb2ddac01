"""The core: target loading, memory plan, the generate loop, verification maths, tree, drafter protocol."""
