"""Where boards keep their pins: one `Storage` backend per module (local folder and object stores on
fsspec, Azure, HTTP data.txt and URL boards, Kaggle). A `Board` never branches on a backend."""
