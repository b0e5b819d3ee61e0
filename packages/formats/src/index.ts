/**
 * @tp/formats — skeleton; see README.md. Nothing is exported yet.
 */
export {};
