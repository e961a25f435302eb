"""One module per notebook: its config, pipeline, tables and closing comparison. Claims never import claims;
what two claims share lives below (:mod:`dynheads_tl.corpus`)."""
