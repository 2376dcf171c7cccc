"""MosaicML Streaming's MDS shards (``streaming.StreamingDataset`` reads them): encoder, writer, reader."""
