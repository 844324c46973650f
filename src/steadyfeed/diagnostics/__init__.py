"""Diagnostics: what the pipeline finds out about its data.

Each module answers one question and returns plain, JSON-able findings that ``report`` renders:

* ``label_noise``: which training samples look mislabeled, from per-sample signals recorded while
  training (ids travel with every batch), and the dataset's estimated label-noise rate.
* ``image_quality``: blur, exposure and contrast, with thresholds from the data's own statistics.
* ``near_duplicates``: perceptual hashes that find re-encoded, resized or cropped copies.
* ``report``: one HTML page with thumbnails and plots of all of the above and the quarantine.

The sections a report understands (every key optional; ids are source sample ids)::

    {"label_noise": {"suspects": [{"id", "given", "predicted", "score", "file"?}],
                     "noise_rate": {"estimate", "low", "high"}, ...},
     "quality": {"checks": {name: {"threshold", "flagged": [{"id", "score", "label"?, "file"?}]}},
                 "per_class": {label: {name: count}}},
     "duplicates": [{"a", "b", "distance", "split_a"?, "split_b"?, "a_file"?, "b_file"?}],
     "quarantine": [{"id", "file"?, "epoch"?, "attempt"?, "error"}],
     "excluded": [{"id", "reason"}]}

Keys added by the modules here (a report shows them where present): ``label_noise`` also has
``threshold``, ``flagged``, ``samples``, ``max_records``, ``aum_histogram`` {edges, counts} and
``split`` (see ``label_noise.LabelNoiseRecorder.findings``), its ``noise_rate`` ``confidence`` and
``method``, its suspects ``loss``, ``records`` and ``flagged``; a ``quality`` flagged entry may have
a ``reason`` (text); any entry may name its ``split`` (a key of the report's ``sources``).
"""
