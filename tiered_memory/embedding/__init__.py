"""Embedders: the protocol the core needs, and the bundled local models."""

from .base import ArrayEmbedder as ArrayEmbedder
from .base import Embedder as Embedder
from .base import chunk_token_ids as chunk_token_ids
from .base import embed as embed
from .base import embed_batched as embed_batched
from .base import embed_query as embed_query
from .base import embedder_name as embedder_name
from .base import normalize as normalize
from .minilm import QUERY_CACHE_SIZE as QUERY_CACHE_SIZE
from .minilm import SentenceTransformerEmbedder as SentenceTransformerEmbedder
from .minilm import bundled_model_path as bundled_model_path
from .static import StaticEmbedder as StaticEmbedder
from .default import EMBEDDER_ENV as EMBEDDER_ENV
from .default import default_embedder as default_embedder
from .default import reopen_with as reopen_with
