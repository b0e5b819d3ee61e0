/**
 * @tp/diffusion — skeleton; see README.md. Nothing is exported yet.
 */
export {};
