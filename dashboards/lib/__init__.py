"""The dashboards' small library: PromQL builders (``queries``), panel builders
(``panels``) and the shared frame (``frame``). One module per dashboard uses them."""
