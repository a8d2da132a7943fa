"""The rules every byte from a board passes before it is used: safe pin names, paths kept inside their
folder, bounded archive extraction, room on the disk, secrets never saved or shown, and Parquet
bounded before pyarrow decodes it. The pipeline reads untrusted Parquet through the same rules."""
