"""The report layer: figure and table writers, the index, the papermill runner and the command line."""
