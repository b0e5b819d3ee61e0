/**
 * @tp/tokenizer — skeleton; see README.md. Nothing is exported yet.
 */
export {};
