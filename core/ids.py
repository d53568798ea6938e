"""The ids every categorical feature reserves: 0 pads a list, 1 is out of vocabulary; the
values' ids start at 2."""

PADDING_ID = 0
OOV_ID = 1
FIRST_ID = 2
