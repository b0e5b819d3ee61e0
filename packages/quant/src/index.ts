/**
 * @tp/quant — skeleton; see README.md. Nothing is exported yet.
 */
export {};
