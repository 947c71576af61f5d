"""The heads' forms and their Gram: the paper's inner product (arXiv 2601.11471 §4.3, Eq. 11) and
the data-aware one, in pure numpy, float64, never forming a d × d matrix.

A layer has H heads; head h is a bilinear form given by two factors, A_h = L_h R_hᵀ:

    QK circuit   L_h = W_Q,h (d × e),  R_h = W_K,h (d × e)    score(x, y) = xᵀ A_h y
    OV circuit   L_h = W_V,h (d × e),  R_h = W_O,hᵀ (d × e)   output of head h for token y = yᵀ A_h

(x, y are residual-stream vectors, e the head width.) A_h is d × d, but nothing here ever forms
it: every quantity comes from the e × e products L_iᵀ L_j and R_iᵀ R_j, or from forms reduced to
the span of a narrow side (`frobenius_gram`).

    raw Gram        G_raw[i,j] = ⟨A_i, A_j⟩_F = tr(A_iᵀ A_j) = Σ_ab (L_iᵀL_j)_ab (R_iᵀR_j)_ab     (Eq. 11)
    data-aware      G_raw[i,j] = ⟨A_i, A_j⟩_Σ = tr(A_iᵀ Σ_L A_j Σ_R) = E[(xᵀ A_i y)(xᵀ A_j y)]

The data-aware measure (`data_gram`) weighs Eq. 11's inner product by the second moments Σ_L, Σ_R
of the inputs each side reads; everything after the Gram (`headlab.analysis.spectrum`) is unchanged.

Scale. A cosine does not see a positive factor per head, so nothing here may either: each head's
factors are first multiplied by powers of two that bring their largest entry into [½, 1)
(`Factors.normalised`; exact, only exponents change), and the Gram is taken of those. Weights
stored at any finite scale, 1e-300 or 1e300, per head or per layer, give the similarity of scale 1,
where the raw Gram ⟨A_i, A_j⟩ itself would underflow to 0 or overflow to inf.

Dead heads. A head whose form is zero, ‖A_h‖_F ≤ DEAD_HEAD_RTOL · ‖L_h‖_F ‖R_h‖_F (zero to within
the round-off of its own factors' products, at any scale; the right side bounds ‖A_h‖_F), is dead:
`normalised_gram` says which heads are live, and the spectrum leaves the dead ones out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

# A head whose ‖A_h‖_F is at most this fraction of ‖L_h‖_F ‖R_h‖_F is dead: computed from the
# factors' products, ‖A_h‖²_F carries round-off of ~e·ε·‖L_h‖²‖R_h‖², i.e. ~1e-7 of the bound for
# e = 128, so a form below 1e-6 of it is zero as far as float64 can tell.
DEAD_HEAD_RTOL = 1e-6
# The reduced route's thin per-head products and memory-bound Gram run ~4x fewer multiply-adds
# per second than the products route's large square ones (OpenBLAS, 2 cores, paper-2.5b shapes),
# and suffer more on a busy machine; `frobenius_gram` weighs their cost by this. Speed only.
REDUCED_SLOWDOWN = 4


@dataclass(frozen=True)
class Factors:
    """One side (L or R) of a layer's per-head factors, stored once per distinct block.

    Head h's d × e factor is  F_h = base @ matrix[:, g·e:(g+1)·e]  with g = index[h]
    (base = None means the identity, so F_h is the column block itself). This covers
      * per-head factors (index = 0..H−1), laid out as a PyTorch Linear weight transposed;
      * shared factors: MQA/GQA keys are one block per KV group, index[h] = h // (H/G), so a
        shared key's products are computed once, not once per head;
      * factors through a shared basis narrower than d (MLA's latent: base = W_dkv, d × d_c;
        LRKV: base = [W_shared | U_1 … U_H]), whose products are taken in that small space.
    """

    matrix: np.ndarray  # (m, G·e): G column blocks of width e
    head_dim: int  # e
    index: np.ndarray  # (H,) block of each head, in [0, G)
    base: np.ndarray | None = None  # (d, m) shared left factor, or None for the identity

    def __post_init__(self):
        matrix = np.asarray(self.matrix, dtype=np.float64)
        index = np.asarray(self.index, dtype=np.int64)
        if matrix.ndim != 2 or self.head_dim < 1 or matrix.shape[1] % self.head_dim:
            raise ValueError(f"Factors.matrix must be 2-D with a multiple of head_dim = {self.head_dim} "
                             f"columns; got shape {matrix.shape}")
        n_blocks = matrix.shape[1] // self.head_dim
        if index.ndim != 1 or index.size == 0 or index.min() < 0 or index.max() >= n_blocks:
            raise ValueError(f"Factors.index must list each head's block in 0..{n_blocks - 1}; got {index}")
        object.__setattr__(self, "matrix", matrix)
        object.__setattr__(self, "index", index)
        if self.base is not None:
            base = np.asarray(self.base, dtype=np.float64)
            if base.ndim != 2 or base.shape[1] != matrix.shape[0]:
                raise ValueError(f"Factors.base must be (d, {matrix.shape[0]}); got shape {base.shape}")
            object.__setattr__(self, "base", base)

    @classmethod
    def per_head(cls, matrix: np.ndarray, head_dim: int, base: np.ndarray | None = None) -> "Factors":
        """One block per head: head h owns columns h·e:(h+1)·e."""
        return cls(matrix, head_dim, np.arange(np.shape(matrix)[1] // head_dim), base)

    @classmethod
    def grouped(cls, matrix: np.ndarray, head_dim: int, n_heads: int) -> "Factors":
        """G blocks shared by consecutive heads: head h uses block h // (H/G) (GQA; MQA is G = 1)."""
        n_blocks = np.shape(matrix)[1] // head_dim
        if n_blocks < 1 or n_heads % n_blocks:
            raise ValueError(f"n_heads = {n_heads} is not a multiple of the {n_blocks} shared blocks")
        return cls(matrix, head_dim, np.arange(n_heads) // (n_heads // n_blocks))

    @property
    def n_heads(self) -> int:
        return self.index.size

    @property
    def n_blocks(self) -> int:
        return self.matrix.shape[1] // self.head_dim

    @property
    def dim(self) -> int:
        """d, the dimension the factors live in."""
        return (self.matrix if self.base is None else self.base).shape[0]

    @property
    def rank_bound(self) -> int:
        """Rows of `coordinates()`: the latent width m, or min(d, G·e)."""
        return self.matrix.shape[0] if self._latent else min(self.dim, self.matrix.shape[1])

    @property
    def _latent(self) -> bool:
        """Whether products go through the base's m × m metric (only worth it when m < d)."""
        return self.base is not None and self.base.shape[1] < self.base.shape[0]

    def normalised(self) -> "Factors":
        """The same heads, each block of `matrix` and the base multiplied by the power of two
        that brings its largest entry into [½, 1) (`power_of_two_scaled`): head h's factor
        becomes c_h F_h with c_h > 0 exact, so cosines are unchanged and no product of these
        factors can overflow or underflow whatever the stored scale."""
        return self._scaled[0]

    @cached_property
    def _scaled(self) -> tuple["Factors", np.ndarray]:
        """`normalised()` and, per block, the exponent k with F_g = 2^k · its normalised factor;
        kept, so the products the Gram takes of it also give `head_norms`."""
        blocks = self.matrix.reshape(self.matrix.shape[0], self.n_blocks, self.head_dim)
        exponents = binary_exponent(np.abs(blocks).max(axis=(0, 2), initial=0.0))
        matrix = np.ldexp(blocks, -exponents[None, :, None]).reshape(self.matrix.shape)
        if self.base is None:
            return Factors(matrix, self.head_dim, self.index), exponents
        base_exponent = binary_exponent(np.abs(self.base).max(initial=0.0))
        return (Factors(matrix, self.head_dim, self.index, np.ldexp(self.base, -base_exponent)),
                exponents + base_exponent)

    def heads(self) -> np.ndarray:
        """Every head's factor F_h as an (H, d, e) array (for checks and small models)."""
        full = self._columns()
        return full.reshape(full.shape[0], self.n_blocks, self.head_dim).transpose(1, 0, 2)[self.index]

    def head_norms(self) -> np.ndarray:
        """‖F_h‖_F for every head, shape (H,): of the normalised factors, times the powers of two
        taken out, so no square overflows or underflows whatever the stored scale."""
        scaled, exponents = self._scaled
        return np.ldexp(scaled._norms(), exponents[self.index])

    def _norms(self) -> np.ndarray:
        """‖F_h‖_F as stored: its squares over- or underflow unless the factors are normalised."""
        if "block_gram" in self.__dict__:  # already computed: its diagonal holds every ‖column‖²
            squares = np.diag(self.block_gram)
        elif self._latent:
            squares = (self.matrix * (self._metric @ self.matrix)).sum(axis=0)
        else:
            squares = (self._columns() ** 2).sum(axis=0)
        return np.sqrt(np.clip(squares.reshape(self.n_blocks, self.head_dim).sum(axis=1), 0.0, None))[self.index]

    @cached_property
    def block_gram(self) -> np.ndarray:
        """XᵀX for the distinct blocks X = [F_1 … F_G] (d × G·e): every e × e product F_gᵀ F_g'."""
        if self._latent:
            return (self.matrix.T @ self._metric) @ self.matrix
        x = self._columns()
        return x.T @ x

    def products(self) -> np.ndarray:
        """All e × e products F_iᵀ F_j as an (H, e, H, e) array; shared blocks are multiplied
        once and only expanded to heads afterwards, by indexing."""
        e, g = self.head_dim, self.n_blocks
        blocks = self.block_gram.reshape(g, e, g, e)
        if self.n_blocks == self.n_heads and np.array_equal(self.index, np.arange(self.n_heads)):
            return blocks
        return blocks[self.index][:, :, self.index]

    def coordinates(self) -> np.ndarray:
        """C (rank_bound × G·e) with CᵀC = XᵀX: the blocks written in an orthonormal basis of a
        space holding them (X = U C, UᵀU = I). From the e × e products (a square root of XᵀX,
        or of the base's BᵀB), or X itself when its G·e columns already span up to d dimensions."""
        if self._latent:  # X = B M: coordinates of B's columns (from BᵀB, m × m) applied to M
            return _gram_root(self._metric) @ self.matrix
        if self.matrix.shape[1] >= self.dim:
            return self._columns()
        return _gram_root(self.block_gram)

    @cached_property
    def _metric(self) -> np.ndarray:
        """BᵀB (m × m): inner products of the base's columns."""
        return self.base.T @ self.base

    def _columns(self) -> np.ndarray:
        return self.matrix if self.base is None else self.base @ self.matrix


def binary_exponent(value):
    """k with value = f·2^k, f ∈ [½, 1) (0 for 0): the power of two that normalises a magnitude."""
    return np.frexp(value)[1]


def power_of_two_scaled(array: np.ndarray) -> np.ndarray:
    """array · 2^−k, k the binary exponent of max|array|, so the largest entry lands in [½, 1).
    Exact: only exponents change. An all-zero array is returned as is."""
    return np.ldexp(array, -binary_exponent(np.abs(array).max(initial=0.0)))


def _gram_root(gram: np.ndarray) -> np.ndarray:
    """C with CᵀC = gram: Lᵀ from the Cholesky factorisation gram = L Lᵀ, or Λ^½ Vᵀ from
    gram = V Λ Vᵀ when gram is singular (e.g. a zero head in a shared block). Cholesky first:
    it is ~20x cheaper, and LAPACK's eigensolver stalls for seconds on a busy machine."""
    try:
        return np.linalg.cholesky(gram).T
    except np.linalg.LinAlgError:
        lam, v = np.linalg.eigh(gram)
        return np.sqrt(np.clip(lam, 0.0, None))[:, None] * v.T


def _cost(f: Factors, what: str) -> int:
    """Multiply-adds of `f.block_gram` ("products") or `f.coordinates()` ("coordinates")."""
    m, n = f.matrix.shape
    d = f.dim
    if f._latent:
        return d * m * m + (m * n * n if what == "products" else m ** 3) + m * m * n
    materialise = d * m * n if f.base is not None else 0
    if what == "products":
        return materialise + d * n * n
    return materialise + (d * n * n + n ** 3 if n < d else 0)


def frobenius_gram(left: Factors, right: Factors, method: str = "auto") -> np.ndarray:
    """G_raw[i,j] = ⟨A_i, A_j⟩_F for A_h = L_h R_hᵀ (Eq. 11), never forming a d × d matrix.

    Two exact routes; "auto" takes the one expected to be faster:
      products  Σ_ab (L_iᵀL_j)_ab (R_iᵀR_j)_ab: two matrix products over the distinct blocks,
                d·(H·e)² each (what MHA needs).
      reduced   write each side in an orthonormal basis of its span, F_h = U C_h (C from the
                e × e products, `Factors.coordinates`); then ⟨A_i, A_j⟩ = ⟨C^L_i C^Rᵀ_i, C^L_j C^Rᵀ_j⟩
                with r_L × r_R reduced forms. Cheap when a side spans few dimensions: MQA's shared
                key (e), MLA's latent (d_c + d_R). Refused when neither side is narrower than d
                (the reduced forms would be d × d).
    """
    if left.n_heads != right.n_heads or left.head_dim != right.head_dim:
        raise ValueError(f"left and right factors disagree: {left.n_heads} vs {right.n_heads} heads, "
                         f"head_dim {left.head_dim} vs {right.head_dim}")
    reducible = left.rank_bound < left.dim or right.rank_bound < right.dim
    if method == "auto":
        h, e, rl, rr = left.n_heads, left.head_dim, left.rank_bound, right.rank_bound
        products = _cost(left, "products") + _cost(right, "products") + h * h * e * e
        reduced = _cost(left, "coordinates") + _cost(right, "coordinates") + h * e * rl * rr + h * h * rl * rr
        method = "reduced" if reducible and REDUCED_SLOWDOWN * reduced < products else "products"
    if method == "products":
        raw = np.einsum("iajb,iajb->ij", left.products(), right.products())
    elif method == "reduced":
        if not reducible:
            raise ValueError("method = 'reduced' needs a side narrower than d; here it would form d × d matrices")
        raw = _reduced_gram(left, right)
    else:
        raise ValueError(f"method = {method!r} is invalid: allowed values are auto, products, reduced")
    return (raw + raw.T) / 2  # exact symmetry; the two triangles differ only by round-off


def _transformed(factors: Factors, root: np.ndarray | None) -> Factors:
    """The factors R F_h (R = None: unchanged). Through a shared base only the base is
    multiplied (d × m), so GQA/MQA blocks stay shared and MLA/LRKV products stay latent."""
    if root is None:
        return factors
    if factors.base is None:
        return Factors(root @ factors.matrix, factors.head_dim, factors.index)
    return Factors(factors.matrix, factors.head_dim, factors.index, root @ factors.base)


def data_gram(left: Factors, right: Factors, left_root: np.ndarray | None, right_root: np.ndarray | None,
              method: str = "auto") -> np.ndarray:
    """G_raw[i,j] = ⟨A_i, A_j⟩_Σ = tr(A_iᵀ Σ_L A_j Σ_R) for A_h = L_h R_hᵀ, the data-aware inner
    product: for independent x ~ (second moment Σ_L) and y ~ (second moment Σ_R),

        ⟨A_i, A_j⟩_Σ = E[(xᵀ A_i y)(xᵀ A_j y)],

    so two heads are alike when their scores agree on the inputs the model actually sees, and
    directions the inputs never visit weigh nothing. With Σ = RᵀR (`inputs.second_moment_root`),
    ⟨A_i, A_j⟩_Σ = ⟨R_L A_i R_Rᵀ, R_L A_j R_Rᵀ⟩_F: the Frobenius Gram of the factors R_L L_h and
    R_R R_h, computed by `frobenius_gram` without forming any A_h. A root of None stands for
    Σ = I on that side; with both None (or both roots I) this is exactly `frobenius_gram`.
    """
    _check_roots(left, right, left_root, right_root)
    return frobenius_gram(_transformed(left, left_root), _transformed(right, right_root), method)


def _check_roots(left: Factors, right: Factors, left_root: np.ndarray | None, right_root: np.ndarray | None) -> None:
    for side, root, factors in (("left", left_root, left), ("right", right_root, right)):
        if root is not None and np.shape(root) != (factors.dim, factors.dim):
            raise ValueError(f"{side}_root must be ({factors.dim}, {factors.dim}) to match the "
                             f"factors' dimension d; got shape {np.shape(root)}")


def normalised_gram(left: Factors, right: Factors, left_root: np.ndarray | None = None,
                    right_root: np.ndarray | None = None, method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(G', live): the Gram of `data_gram` (of `frobenius_gram` without roots) taken of the
    heads' forms each scaled by an exact positive power of two (`Factors.normalised`, the roots
    by `power_of_two_scaled`), so G'[i,j] = c_i c_j G_raw[i,j] with c_h > 0 and no product can
    overflow or underflow; and which heads are live, ‖A_h‖ > DEAD_HEAD_RTOL · ‖L_h‖ ‖R_h‖ (for
    the data measure: of the factors R L_h, R R_h it compares). `cosine_similarity(G', live)`
    is the layer's similarity at any stored scale."""
    _check_roots(left, right, left_root, right_root)
    left, right = (_transformed(f.normalised(), None if root is None else power_of_two_scaled(root))
                   for f, root in ((left, left_root), (right, right_root)))
    gram = frobenius_gram(left, right, method)
    bound = left._norms() * right._norms()  # normalised already: the stored norms are safe
    return gram, np.sqrt(np.clip(np.diag(gram), 0.0, None)) > DEAD_HEAD_RTOL * bound


def _reduced_gram(left: Factors, right: Factors) -> np.ndarray:
    """Pairwise inner products of the reduced forms C^L_h C^Rᵀ_h (r_L × r_R).

    A shared block is multiplied once for its whole group of heads (MQA/GQA), other heads one
    matrix product each. The final H × H Gram has a huge inner dimension and a tiny output,
    which OpenBLAS runs erratically slowly (seconds to a minute) on a busy machine, so it goes
    through numpy's own single-threaded einsum loop, one cache-sized slab of columns at a time.
    """
    h, e = left.n_heads, left.head_dim
    cl, cr = left.coordinates(), right.coordinates()
    rl, rr = len(cl), len(cr)
    bl = cl.reshape(rl, left.n_blocks, e).transpose(1, 0, 2)  # (G_L, r_L, e)
    br = cr.reshape(rr, right.n_blocks, e).transpose(1, 0, 2)  # (G_R, r_R, e)
    forms = np.empty((h, rl, rr))
    if right.n_blocks < h:  # heads of group g: [C^L_h …] (n_g·r_L × e) @ C^Rᵀ_g
        for g in range(right.n_blocks):
            heads = np.flatnonzero(right.index == g)
            forms[heads] = (bl[left.index[heads]].reshape(-1, e) @ br[g].T).reshape(len(heads), rl, rr)
    elif left.n_blocks < h:  # C^L_g @ [C^R_h …]ᵀ (e × n_g·r_R)
        for g in range(left.n_blocks):
            heads = np.flatnonzero(left.index == g)
            stacked = (bl[g] @ br[right.index[heads]].reshape(-1, e).T).reshape(rl, len(heads), rr)
            forms[heads] = stacked.transpose(1, 0, 2)
    else:
        for head in range(h):
            forms[head] = bl[left.index[head]] @ br[right.index[head]].T
    flat = forms.reshape(h, -1)
    step = 2 ** 14  # columns per slab: H·step doubles stay in cache while every pair reads them
    return sum(np.einsum("ik,jk->ij", flat[:, s:s + step], flat[:, s:s + step]) for s in range(0, flat.shape[1], step))
