"""APIs shaped like other frameworks', on ezflow: :mod:`ezflow.compat.ezmsg`."""
