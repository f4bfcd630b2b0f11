"""`import ddp` needs no torch: the bucket vocabulary is plain Python, and each wrapper is imported
from its module on first use."""

from lazy_package import check_lazy_package

import ddp


def test_import_ddp_and_its_bucket_vocabulary_import_no_torch_and_every_name_is_there():
    check_lazy_package(ddp, light_use="ddp.bucket_bytes(ddp.DEFAULT_BUCKET_SIZE_MB)")
