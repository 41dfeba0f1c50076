"""``tarindex export``."""

from __future__ import annotations

import click


@click.command("export")
@click.argument("index")
@click.option("--dali", "dali", type=click.Path(file_okay=False), metavar="DIR", help="Write DALI webdataset index files (one .idx per shard) into DIR.")
@click.option("--wids", "wids", type=click.Path(dir_okay=False), metavar="FILE", help="Write a wids shard list (JSON) to FILE.")
@click.option("-q", "--quiet", is_flag=True, help="No summary.")
def command(index: str, dali: str | None, wids: str | None, quiet: bool) -> None:
    """Write indexes for other loaders from INDEX (no shard is read).

    --dali DIR: DALI's webdataset index files, as its wds2idx tool writes them, for fn.readers.webdataset
    (index_paths=...). --wids FILE: a shard list with sample counts for wids.ShardListDataset.
    """
    if dali is None and wids is None:
        raise click.UsageError("nothing to export: give --dali DIR and/or --wids FILE")
    from ..export import export_dali, export_wids

    if dali is not None:
        paths = export_dali(index, dali)
        if not quiet:
            click.echo(f"{dali}: {len(paths)} DALI index files")
    if wids is not None:
        export_wids(index, wids)
        if not quiet:
            click.echo(f"{wids}: wids shard list")
